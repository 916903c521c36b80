"""What is known of a case without timing it: memory predicted under fake tensors, the roofline, the attribution
tables, the case's plan, and the error rates of the timed verdicts."""
