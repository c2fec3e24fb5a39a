"""Experiments: the `hetsim` command, configs and scripts that call the library."""
