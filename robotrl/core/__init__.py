"""robotrl.core: the vocabulary every stage shares and that imports nothing else of robotrl: the task spec
(observation and action layout, checked at every boundary) and the file helpers of checkpoints and manifests."""
