"""What an ablation leaves and how it is read: the results folder and summary.csv (`folder`), the loaded
result set (`resultset`), paired comparisons and their statistics (`comparisons`, `compare`, `seed_stats`),
training cost (`cost`), plots, and `mtp report` (`report/`). Nothing here trains or decodes."""
