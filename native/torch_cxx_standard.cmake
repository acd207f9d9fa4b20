# Included after find_package(Torch) by both CMake projects (the addon's CMakeLists.txt and the GPU
# check's native/check/CMakeLists.txt), before their targets are created.
# PyTorch 2.10 and later need C++20 (their ATen.h stops below 202002L); older ones C++17.
foreach(_dir IN LISTS TORCH_INCLUDE_DIRS)
  if(EXISTS "${_dir}/ATen/ATen.h")
    file(READ "${_dir}/ATen/ATen.h" _aten_h LIMIT 600)
    if(_aten_h MATCHES "__cplusplus < 202002L")
      set(CMAKE_CXX_STANDARD 20)
      message(STATUS "libtorch needs C++20: building with it")
    endif()
  endif()
endforeach()
