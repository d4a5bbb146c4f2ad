"""EAGLE-1/2/3: a small network over the target's features grows a dynamic draft tree.

net.py (the network), tree.py (EAGLE-2's dynamic tree and the ``tree`` option), options.py
(``EagleOptions``), drafter.py (the drafter), graft.py (prompt lookup grafted onto its trees),
build.py (a drafter from a saved folder or a spec), io.py (save, load and the drafters shipped
in ``artifacts/``)."""
