"""The code the studies share: the entry point (cli), the statistics and the one verdict rule
(stats, verdicts), when a memory emerged (emergence), which episode ids a run trained with
(provenance), one regime run read by distance bucket (recall), the report pieces of a sweep
read by length (sweep_report, sweep_claims) and markdown tables (markdown). It imports swax and
never a study."""
