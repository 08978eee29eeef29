"""``smgrl demo``: a fleet of fake engines, the gateway on a journal file, one refit cycle."""
