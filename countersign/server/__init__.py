"""The reviewers' inbox: login, pending approvals across conversations, proven decisions."""
