"""torch.fx detection: the engine (:mod:`.engine`) and the matchers (:mod:`.matchers`)."""
