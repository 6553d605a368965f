"""Agent traces, recorder, replayer, the 4-arm protocol and its report."""
