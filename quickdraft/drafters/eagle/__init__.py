"""EAGLE-1/2/3: a small network over the target's features grows a dynamic draft tree.

net.py (the network), tree.py (EAGLE-2's dynamic tree and its options), drafter.py (the
drafter), io.py (save, load and the drafters shipped in ``artifacts/``)."""
