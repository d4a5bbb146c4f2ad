"""Medusa: extra heads on the target's last hidden state draft a sparse tree.

net.py (the heads, save and load, those shipped in ``artifacts/``), tree.py (the trees and the
``tree`` option), options.py (``MedusaOptions``), drafter.py (the drafter and its builder)."""
