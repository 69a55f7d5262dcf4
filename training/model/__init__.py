"""The model and its optimizers.

:mod:`.nn` holds the layers of a multilayer perceptron whose parameters and gradients are views into
one flat buffer each, :mod:`.optim` the optimizers and learning-rate schedules that update the flat
parameters in place, and :mod:`.layer_trace` each layer's trace events (the job profile's raw
material).

Imports: :mod:`collectives` (the array module, the timeline) and the floor below it; nothing else of
:mod:`training`.
"""
