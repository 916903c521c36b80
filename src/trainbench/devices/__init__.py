"""Device backends and the machine: what a device is, does and reports, real or simulated."""
