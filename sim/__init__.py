"""hetsim's model of the world: workloads, clusters, plans, cost model and evaluators."""
