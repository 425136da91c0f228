"""The sans-IO core: pure state machines. No sockets, no clock, no global randomness."""
