"""Model states in chunks across device, host memory and disk (PatrickStar, ZeRO-Infinity);
`states.ChunkedStates` composes the parts."""
