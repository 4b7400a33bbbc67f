"""`traceless eval`: lm-evaluation-harness against a running traceless server, on task sets that
ship with the project (traceless_tools/eval/tasks/)."""
