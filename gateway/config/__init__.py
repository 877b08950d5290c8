"""Configuration: the settings, read once from the environment and `.env`, with LMI's, TGI's
and SageMaker's names for them, and the priority classes.

May import: protocols/ only. Everything else in gateway/ may import it.
"""
