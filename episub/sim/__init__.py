"""The simulator: thousands of sans-IO cores on one discrete-event clock, in one process.

`engine` carries out the cores' outputs over a modelled network (`latency`), `metrics`
measures what happened, `scenarios` scripts joins, crashes, churn and partitions with
the parameters of `params`, `seeds` derives every random stream from one seed, and `cli`
is the `episub sim` command. Same arguments, same seed: a byte-identical report.
"""
