#!/bin/bash
# placeholder: edited until the lock is acquired
echo "not ready" >&2
