"""Rollouts on gRPC engines: the HTTP bodies as Generate requests (``build``), the Generate
stream as the HTTP answers (``render``, ``detok``), and the exchange the data plane's dispatch
uses for a gRPC instance (``exchange``), with the tokenizer each engine served (``tokenizers``)."""

from smgrl.dataplane.grpc.exchange import GrpcAnswer, GrpcEngines

__all__ = ["GrpcAnswer", "GrpcEngines"]
