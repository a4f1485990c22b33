"""`mtp ablate`'s grid: its cells (`cells`), the plan (`plan`), the stages each cell runs (`stages`),
the [source] run and baseline of recipes that start from a checkpoint (`source`), the results
folder's lock and stage log (`lock`) and the progress view (`view`). The loop that runs it here is
`mtp_cli.ablate`; on Slurm, `mtp_cli.launch`."""
