"""Offline validity: whether an offline number ranks checkpoints the way closed-loop success does
(statistics: the agreements and their intervals; plots: metric against success)."""
