"""One module per AWM stage; each reads its inputs from the run's stores and appends its outputs."""
