"""What a job's NCCL debug logs add to the analysis: their collectives joined to the traces' (join), the communicators'
topology and links (topology), and the problems the logs report (problems)."""
