"""The simulator: thousands of sans-IO cores on one discrete-event clock, in one process.

`engine` carries out the cores' outputs over a modelled network (`latency`), `metrics`
measures what happened, `scenarios` scripts joins, crashes, churn and partitions, and
`cli` is the `episub sim` command. Same arguments, same seed: byte-identical report.
"""
