"""Projections: pure folds from journal events to the state the gateway serves from memory."""
