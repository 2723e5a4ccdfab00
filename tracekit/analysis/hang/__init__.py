"""A hang, named from the Flight Recorder dumps beside the traces: the dumps as one job (dumps), where each rank stands
and who never came (stuck, result, text), and desync (desync)."""
