"""The ten chat prompts the parity tests on the built-in model share (plain questions and tasks of
a few words to a sentence, in English): the benchmark's greedy-agreement set, defined once there."""

from traceless_tools.bench.greedy_set import CHAT, PLAIN

CHAT_PROMPTS = list(CHAT)
PLAIN_OPENINGS = list(PLAIN)
