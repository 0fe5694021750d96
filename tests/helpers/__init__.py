"""What the test modules share (no test module imports another, nor conftest):

configs      composing conf/ in-process, the small presets the tests use
processes    running main.py as a user does, in a working folder of its own
outcomes     paired outcome tables as a user would export them
runs         finding and checking MLflow runs and sweeps
reliability  recording each bad input and fault a test tries (docs/reliability.md)
servers      PostgreSQL, S3 (moto), `mlflow server`, a killing proxy, on 127.0.0.1
"""
