"""kvpool service."""
