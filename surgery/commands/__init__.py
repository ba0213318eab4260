"""The surgery commands that need no eval or train: cli.py adds them to the `surgery` group."""
