"""What every running part uses, torch-free: the cost ledger of a case's phases, the progress watchdog, atomic
file writes and how a started process ends."""
