"""The preprocessing pool: workers on CPU nodes that make a records dataset's rows
(decode, augment) for the trainers, over Arrow Flight (:mod:`.worker`), and the
trainer's reader of their rows (:mod:`.client`); what a worker runs travels as JSON
(:mod:`.spec`), the rows as Arrow (:mod:`.wire`)."""
