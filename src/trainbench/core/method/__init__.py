"""The measurement method: warm-up, synchronized rounds, memory and work passes, the judge that measures again,
the executor and runner of a case (in this process, in fresh ones, as DDP ranks) and the asv suite's entry."""
