"""The Textual app: the live soak and the replay of a recorded one."""
