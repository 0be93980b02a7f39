"""rmserve on a Ray cluster: scoring-server replicas as Ray actors.

Ray places the replicas (one placement group each, packed on one node), restarts what dies and
says where they are; rmserve keeps what only it does: groups, prefix caching, in-place swaps,
fingerprints and the score store. Each replica owns one ``rmserve serve`` process (the same
code as a hand-started server) on the GPUs Ray gives it.

- :mod:`rmserve.cluster.replica`: what one replica runs (:class:`ReplicaSpec`,
  :class:`ReplicaServer`, the actor's body); imports no Ray.
- :mod:`rmserve.cluster.ray_cluster`: the driver side (connect, start a named or job-scoped
  set of replicas, status, stop, loss watching); needs the ``[ray]`` extra.
"""
