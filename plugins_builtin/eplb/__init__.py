"""Expert-parallel load balancing: the placement policy (``placement``) and the ``eplb`` hook plugin (``balancer``)."""
