"""hack/rtj_local"""
