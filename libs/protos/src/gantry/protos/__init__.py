"""gantry.protos: generated gRPC/protobuf code (see protos/ and make protos)."""
