"""Flow-matching residual estimators and the per-sample gradient artifact."""
