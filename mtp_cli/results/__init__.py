"""What an ablation leaves and how it is read: the results folder and summary.csv (`folder`), the loaded
result set (`resultset`), the rows of the Δ tables (`delta_rows`: which runs each compares), the estimates and
intervals drawn for them (`compare`, `seed_stats`), what an ablation will cost before it runs (`estimate`;
`report/costs` renders what it did cost), plots, and `mtp report` (`report/`). Nothing here trains or decodes."""
