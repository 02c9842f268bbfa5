"""The stateful personalized-FL core shared by every algorithm."""
