"""The ranks as one run: how they meet and what they agree on.

- runstore.py: the run's store sealed with its secret, for the training and a user's script alike;
- rendezvous.py: how the ranks meet, and how a survivor tells a frozen or missing rank from a busy one;
- group.py: `RankGroup`, what the ranks agree on and who is who when one is lost;
- netcheck.py: which network NCCL chose across nodes, and what the run does on TCP sockets.
"""
