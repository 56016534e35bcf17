"""Soft isolation: the elastic rate limiter's control law (`erl`) and the loop that keeps each soft
worker's shared memory current (`soft`)."""
