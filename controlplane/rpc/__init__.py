"""The gRPC transport: servicers, proto<->domain conversion, auth and error mapping."""
