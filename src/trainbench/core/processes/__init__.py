"""Entry points of the processes trainbench starts and their transport: a torchrun rank, an A/B side's worker."""
