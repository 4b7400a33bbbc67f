"""The ten chat prompts the parity tests on the built-in model share (plain questions and tasks of
a few words to a sentence, in English)."""

CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis to a child.",
    "List three prime numbers greater than 100.",
    "Translate 'good morning' into Spanish and German.",
    "What is 17 times 23?",
    "Give me a recipe for pancakes.",
    "Who wrote Pride and Prejudice?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "Write a Python function that reverses a string.",
]
