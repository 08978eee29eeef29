"""gRPC to inference engines, on trio over the h2 state machine (see ``channel``)."""
