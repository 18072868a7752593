"""gantry.training: the training runtime that gives any PyTorch model the platform's features.

Distributed data parallel training, mixed precision, gradient compression, asynchronous
encrypted checkpoints with exact resume, and differentially private training, configured by
the job spec's ``training`` section.
"""
