"""The doctor's probe and listener on a node, and `ddpl init`'s look at a new one (seek)."""
