"""Work made of several runs, processes or sessions on one machine: an A/B of two environments, bisecting the
commits, the GPU night and its plan, the doctor's checks of this machine against the suite."""
