"""What the node's held torchrun imports while it waits for `go` (launcher/node/agent/prestart.py): nothing to import
here."""
