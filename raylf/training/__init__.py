"""Training a client's model: where its parameters live in one flat vector (``layout``), the
sequential trainer that runs a client's local update one client at a time (``sequential``), the
cohort trainer that runs many clients' in lockstep (``cohort``), the SGD schedule and step both
call (``sgd``), and the model rewrites that make training faster without changing its arithmetic
(``rewrites``)."""
