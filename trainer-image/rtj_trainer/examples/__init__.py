"""Example training scripts for the trainer runtime."""
