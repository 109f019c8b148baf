"""`inv sync` on a node: syncd receives the tree (relaying it on), syncstage puts it in place."""
