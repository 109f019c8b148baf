"""What the node's held torchrun imports while it waits for `go` (launcher/node/prestart.py): nothing to import here."""
