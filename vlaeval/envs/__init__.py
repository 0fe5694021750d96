"""The simulated worlds policies act in (Meta-World scenes, disturbances, obstacles): below `policy`."""
