"""The draft-model drafter: a smaller model of the same vocabulary proposes the drafts."""
